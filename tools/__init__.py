"""Command-line tools: the tenant registry CLI, which acts on a deployment's data directly (no
server); the installer's reading of pip's settings for uv (``make install``); and where a
command's CPU goes, by kind of process (how CI's time was split: tests/README.md). They may import
the runners and the build pipeline; nothing imports them."""
