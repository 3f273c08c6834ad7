"""The simulated lab: SSH hosts in network namespaces with fake P40 hardware."""
