"""The daemon's configuration: limits, options, listen addresses (the option parser reads only these)."""
