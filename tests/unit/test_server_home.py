"""Every server the benchmark and the tests start with ``bentoml serve`` has a BentoML home of its
own (its metrics directory), with the shared model, bento and tenant stores linked in."""

from __future__ import annotations

from pathlib import Path

from testkit.processes import bentoml_serve, own_home


def test_each_bentoml_serve_has_a_home_of_its_own_sharing_models_bentos_and_tenants(
    tmp_path, monkeypatch
) -> None:
    """`bentoml serve` empties its home's metrics directory as it starts: two graphs on one home
    would take each other's metric files away. Each gets its own home, with the shared stores."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("BENTOML_HOME", str(shared))
    a = Path(own_home(tmp_path / "logs" / "a.log")["BENTOML_HOME"])
    b = Path(bentoml_serve(".", tmp_path / "logs" / "b.log").env["BENTOML_HOME"])
    assert a != b and shared not in (a, b)
    for home in (a, b):
        for name in ("models", "bentos", "tenants"):
            assert (home / name).resolve() == (shared / name).resolve()
        assert not (home / "prometheus_multiproc_dir").exists()  # bentoml serve makes its own
    assert own_home(tmp_path / "logs" / "a.log")["BENTOML_HOME"] == str(a)  # again: the same
    # A caller's home wins.
    mine = bentoml_serve(".", tmp_path / "logs" / "c.log", env={"BENTOML_HOME": "/elsewhere"})
    assert mine.env["BENTOML_HOME"] == "/elsewhere"


def test_a_home_follows_the_shared_home_it_is_made_for(tmp_path, monkeypatch) -> None:
    # The same log path served again after BENTOML_HOME changed: the links point at the new one.
    log = tmp_path / "logs" / "a.log"
    for shared in (tmp_path / "one", tmp_path / "two"):
        monkeypatch.setenv("BENTOML_HOME", str(shared))
        home = Path(own_home(log)["BENTOML_HOME"])
        assert (home / "models").resolve() == (shared / "models").resolve()
