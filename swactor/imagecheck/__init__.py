"""Check `docker/` without a Docker engine: replay the image build on a bare Debian
root and run the compose topology's commands in it (`python -m swactor.imagecheck`)."""
