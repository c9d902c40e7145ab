"""Tests of the Kueue admission-check controller."""
