"""What travels between workers: the wire formats of a pseudo-gradient, their codec and byte
accounting (docs/algorithm.md#wire-codecs)."""
