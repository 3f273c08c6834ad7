"""p40fleet's pyinfra operations, one module per concern (importing them changes nothing)."""
