"""syncs"""
