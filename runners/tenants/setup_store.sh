#!/bin/sh
# Run by the image build as root (bentofile docker.setup_script), before the image switches to
# BentoML's user: the tenant store's directory, owned by that user. A fresh named volume mounted
# there takes the directory's owner, so no container has to chown the store as root at start.
set -e
mkdir -p /var/lib/bento-bundle/tenants
chown bentoml:bentoml /var/lib/bento-bundle/tenants
