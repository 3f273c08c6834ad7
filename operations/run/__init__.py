"""The run's glue: what every deploy calls around the operations, with no ``@operation`` of
its own. Importing changes nothing."""
