"""The front-door kit every door uses: admission, identity, connection limits, reply sizes."""
