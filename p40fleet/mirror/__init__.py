"""A fleet's own mirror: build it from the pins and the locks, check it, serve it (issue 27).

``python -m p40fleet.mirror build DIR [--inventory INV]`` fetches what the fleet's specs need,
each file checked against its pinned sha256 before it lands in ``DIR``; ``verify DIR`` checks
``DIR`` against its manifest; ``serve DIR --bind ADDR:PORT`` serves it with byte ranges. Layout
(what ``stack["mirror"]`` points at)::

    DIR/artifacts/FILENAME          driver, CUDA, cuDNN, Miniconda, training archives
    DIR/simple/NAME/FILE            PEP 503 index of every locked wheel/sdist (+ index.html)
    DIR/git/NAME.git                bare mirrors holding the pinned commits (dumb HTTP)
    DIR/conda/SUBDIR/FILE           every package of the conda env's explicit lock, where
                                    condalock.render puts it (conda_channel: BASE/conda)
    DIR/apt/dists/SUITE, pool/      signed apt repository of the deploy's packages (with
                                    --kernel; p40fleet.mirror.apt), its key p40fleet-mirror.gpg
    DIR/keys/                       the apt repository's signing key (never served)
    DIR/manifest.json               every file: kind, name, url fetched from, sha256, size

This package runs on the controller. The hosts' use of the mirror is the ``mirror`` component
of the deploy: ``facts/mirror.py`` (what apt reads, does a URL answer) and
``operations/mirror.py`` (the apt source pointed at ``DIR/apt``), tested in tests/test_mirror.py.

The builder lives in ``p40fleet.mirror.build`` and the check in ``p40fleet.mirror.manifest``;
this package imports neither, so a deploy that needs only ``p40fleet.mirror.fetch`` (the
controller's artifact push) does not load the builder and its apt code on every run.
"""
