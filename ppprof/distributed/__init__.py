"""Everything that talks to other ranks: the launcher, point-to-point activation transfer, and collectives."""
