"""The installer doubles the lab's mirror serves, built from real formats.

* :mod:`.pins`: the versions and file names of the doubles (the lab's copy of the stack pins,
  held to the spec's defaults by ``tests/test_lab_pins.py``);
* :mod:`.elf`: tiny real ELF objects (kernel modules, shared libraries) made with gcc;
* :mod:`.archive`: deterministic tar archives and makeself-style self-extracting installers;
* one builder per installer double: :mod:`.driver`, :mod:`.cuda`, :mod:`.cudnn`,
  :mod:`.miniconda`.

:mod:`p40lab.mirror` puts them together into the mirror's ``artifacts/``.
"""
