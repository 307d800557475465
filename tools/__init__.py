"""Operator tools that act on a deployment's data directly (no server): the tenant registry CLI.
They may import the runners and the build pipeline; nothing imports them."""
