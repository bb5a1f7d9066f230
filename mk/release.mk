# Release: both images and the chart through a registry (tools/release.sh), the chart's values pinned by digest.
.PHONY: release

release: binaries ## Build and push both images and the chart (values pinned by digest): REGISTRY=host/path [VERSION=pyproject's] [PLAIN_HTTP=1] [COMPRESSION=gzip|zstd]
	@tools/images/engine.sh
	REGISTRY="$(REGISTRY)" VERSION="$(VERSION)" PLAIN_HTTP="$(PLAIN_HTTP)" COMPRESSION="$(COMPRESSION)" tools/release.sh
