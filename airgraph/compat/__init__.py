"""Compatibility layers: other projects' names for airgraph's features."""
