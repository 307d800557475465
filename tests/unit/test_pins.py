"""Every bento pins the versions the project was tested with (pyproject.toml is the source)."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from testkit.processes import ROOT

BENTOFILES = [
    "bentofile.yaml",
    "services/tokenizer/bentofile.yaml",
    "runners/onnx/bentofile.yaml",
    "runners/tf/bentofile.yaml",
    "runners/tenants/bentofile.yaml",
]


def project_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [
        d for extra in project["optional-dependencies"].values() for d in extra
    ]
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", spec).groups() for spec in specs)


@pytest.mark.parametrize("bentofile", BENTOFILES)
def test_bentofile_pins_match_the_project(bentofile: str) -> None:
    pins = project_pins()
    packages = yaml.safe_load((ROOT / bentofile).read_text())["python"]["packages"]
    assert packages, bentofile
    for spec in packages:
        name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", spec).groups()
        assert pins.get(name) == version, f"{bentofile}: {spec}, pyproject says {pins.get(name)}"
    assert "bentoml==1.4.39" in packages


def test_each_bento_carries_only_its_own_engine() -> None:
    def names(bentofile: str) -> set[str]:
        return {
            p.split("==")[0]
            for p in yaml.safe_load((ROOT / bentofile).read_text())["python"]["packages"]
        }

    assert not names("services/tokenizer/bentofile.yaml") & {"onnxruntime", "tensorflow-cpu"}
    assert "tensorflow-cpu" not in names("runners/onnx/bentofile.yaml")
    assert "onnxruntime" not in names("runners/tf/bentofile.yaml")
