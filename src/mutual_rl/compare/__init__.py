"""The regime comparison, the project's headline result: ``mutual-rl compare`` (:mod:`.cli`).

* :mod:`.labels`: every label with its shipped config, the driver's overrides and its colour, style and marker;
* :mod:`.runner`: launching and resuming the ``mutual-rl fit`` runs (one per label and seed);
* :mod:`.runs`, :mod:`.step0`, :mod:`.report`: reading the runs' TensorBoard scalars (tag names in :mod:`.tags`),
  the step-0 diagnostics, ``table.md`` / ``diagnostics.md`` / the JSON files;
* :mod:`.plots`: the figures (matplotlib, imported only there: ``pip install "mutual-rl[plot]"``);
* :mod:`.real_pair`: the real-model pair report (``mutual-rl compare real``), through the same launcher.
"""
