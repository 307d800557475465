"""Operator tools that act on a deployment's data directly (no server): the tenant registry CLI;
and the installer's reading of pip's settings for uv (``make install``). They may import the
runners and the build pipeline; nothing imports them."""
