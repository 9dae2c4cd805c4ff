"""lakefuse: Git-style version control for data lakes, through a plain filesystem mount."""

__version__ = "0.1.0"
