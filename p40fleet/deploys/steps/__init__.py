"""The deploys' steps, one module per ``deploy/*.py`` entry point, each a ``run()`` for the
current host; ``p40fleet.deploys`` wraps them as pyinfra ``@deploy`` functions."""
