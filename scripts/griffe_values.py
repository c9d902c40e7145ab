"""A griffe extension for the API reference: a constant built by an expression (``f"{DOMAIN}/enrol"``) is
shown with the value it has once imported (``'dispatch.phpboyscout.uk/enrol'``), the label key a user
types, not the expression that builds it."""

from __future__ import annotations

import importlib
from typing import Any

import griffe


class RealValues(griffe.Extension):
    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        if attr.value is None or not isinstance(attr.parent, griffe.Module):
            return
        written = str(attr.value)
        if not any(mark in written for mark in ("{", "+", "(")) and not written.isidentifier():
            return  # a literal already
        try:
            value = getattr(importlib.import_module(attr.parent.path), attr.name)
        except (ImportError, AttributeError):
            return
        if isinstance(value, str | int):
            attr.value = repr(value)
