"""What the daemon keeps: the model cache, uploads, their records and durability, the board's reservations."""
