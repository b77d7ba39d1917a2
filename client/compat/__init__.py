"""RKNN-Toolkit2 and rknn-toolkit-lite2 compatible classes over the idiomatic API."""
