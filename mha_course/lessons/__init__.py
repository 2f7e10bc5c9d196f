"""One notebook's helpers, named by topic (module -> notebook):

positions_lab   11 positions and RoPE
"""
