"""frames"""
