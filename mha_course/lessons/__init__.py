"""One notebook's helpers per module, named by topic (the table module -> notebook is in each docstring)."""
