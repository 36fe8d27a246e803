"""model.num_threads: an explicit count is applied; the default never exceeds this process's share of cores."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.threads import available_cores, configure_threads, default_threads


def test_explicit_count_and_default_cap(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert configure_threads(1) == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(available_cores() * 4))
        torch.set_num_threads(max(2, available_cores()))
        assert default_threads() == 1  # more local processes than cores: one thread each
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        assert default_threads() == min(torch.get_num_threads(), available_cores())
        assert configure_threads(None) <= available_cores()
    finally:
        torch.set_num_threads(before)


def test_bad_count_names_the_setting():
    with pytest.raises(ValueError, match=r"model.num_threads must be >= 1 \(got 0\)"):
        configure_threads(0)
