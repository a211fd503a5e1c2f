"""The fake EGL and CUDA driver libraries (C sources) and their build (build.py)."""
