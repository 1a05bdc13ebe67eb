"""Fixtures shared across test directories: the operator on the local cluster."""

pytest_plugins = [
    "e2e.tests.operator_support",
    "e2e.tests.image_support",
    "e2e.tests.activator_support",
]
