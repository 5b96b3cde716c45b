"""Shared libraries, each loaded lazily on first use and once."""
