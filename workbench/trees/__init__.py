"""Trees from numbers: the tree type and its files, accuracy tables, optimal trees. No torch."""
