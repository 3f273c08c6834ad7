"""Example inventory of a real P40 lab (addresses are TEST-NET placeholders: 192.0.2.0/24).

Copy it, put in your hosts, then::

    pyinfra -y inventories/lab.py deploy/<deploy>.py           # all P40 hosts
    pyinfra -y inventories/lab.py deploy/<deploy>.py --limit p40-02

Lab-wide stack settings live in ``inventories/group_data/all.py`` (loaded automatically, key
``stack``). Per-host differences go here as host data ``stack_host``: it is deep-merged over
``stack``, so a host only lists what differs. Both are validated before a host is touched; a
host with a bad value is refused on its own, with the field and the fix.

SSH: host keys are checked strictly. Collect them once, compare the fingerprints with the
consoles (``ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`` on each host), then::

    ssh-keyscan -t ed25519 192.0.2.11 192.0.2.12 192.0.2.13 >> inventories/known_hosts.lab

Keys come from ssh-agent or ~/.ssh/config — never put passwords or keys in this file.

sudo: the deploys connect as ``admin`` and run every step as root through ``sudo`` (``_sudo``
below; facts too). Recommended: a dedicated deploy account whose sudo needs no password, i.e.
on each host, in ``visudo -f /etc/sudoers.d/p40fleet``::

    admin ALL=(ALL:ALL) NOPASSWD: ALL

(or connect as ``root`` with a key and drop ``_sudo``). If your sudo must ask a password, give
it for one run through the environment, never in this file or on the command line::

    read -rs P40FLEET_SUDO_PASSWORD && export P40FLEET_SUDO_PASSWORD   # typed, not echoed
    pyinfra -y inventories/lab.py deploy/full.py; unset P40FLEET_SUDO_PASSWORD

pyinfra masks it in its output and logs, but it sends it to each host inside the remote
command (``env SUDO_ASKPASS=… PYINFRA_SUDO_PASSWORD=<password> sudo -H -A -k sh -c …``): for
the moment that command starts, any user of that host who lists processes
(``/proc/*/cmdline``) can read it, and sudo's environment holds it (see README, "When it
fails"). Hence the NOPASSWD rule for a dedicated account.
"""

import os

# Data shared by every host of the group `p40` (pyinfra connector settings).
_SSH = {
    "ssh_user": "admin",  # a sudo-capable admin account, see "sudo" above
    "_sudo": True,  # every operation and fact runs as root through sudo
    "ssh_strict_host_key_checking": "yes",  # unknown or changed host key = refuse to connect
    "ssh_known_hosts_file": "inventories/known_hosts.lab",  # relative to the repo root
}
if os.environ.get("P40FLEET_SUDO_PASSWORD"):  # only when your sudo rule asks one (see above)
    _SSH["_sudo_password"] = os.environ["P40FLEET_SUDO_PASSWORD"]

# The P40 training hosts: (name, host data). ssh_hostname is the address pyinfra connects to.
p40 = (
    [
        ("p40-01", {"ssh_hostname": "192.0.2.11"}),
        ("p40-02", {"ssh_hostname": "192.0.2.12"}),
        (
            "p40-03",
            {
                "ssh_hostname": "192.0.2.13",
                # Per-host override, deep-merged over group_data/all.py's `stack`: this host has
                # a small root disk, so the downloads (CUDA alone is 4.3 GB) go to /data, and it
                # may be rebooted by the deploy (it runs no long jobs). The cache is safe only
                # while /data and / are root's and not writable by others without the sticky bit
                # (chown root:root /data && chmod 755 /data): whoever can rename entries in /data
                # can swap the cache for one holding its own runfile, which root then runs (S7).
                # The download refuses the host naming the parent otherwise; never make the
                # training user's home /data itself.
                "stack_host": {
                    "paths": {"artifact_cache": "/data/p40fleet-cache"},
                    "policy": {"allow_reboot": True},
                },
            },
        ),
    ],
    _SSH,
)

# The Ray head: the one host that runs `ray start --head` and launches verl's trainer; the
# others join it as workers. It must also be listed in `p40` (this group only marks it); keep
# exactly one host here.
ray_head = ["p40-01"]
