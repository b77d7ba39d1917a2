"""The HTTP endpoint: metrics, health, and the routes KServe REST adds."""
