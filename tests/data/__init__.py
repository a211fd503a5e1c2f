"""Test clips and the helpers that make and read them (see make_clips.py)."""
