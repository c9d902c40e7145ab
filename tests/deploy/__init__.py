"""Checks of what users install: the Helm chart against deploy/, the monitoring extras."""
