"""Build a bento per service and containerize them (``make bentos``, ``make images``).

    python deploy/bentos.py build [--base-image IMAGE] [--only NAME,...]
    python deploy/bentos.py images [--base-image IMAGE] [--only NAME,...] [--tag TAG]

Each bentofile is built as written, except that ``--base-image`` sets ``docker.base_image`` (the
local Debian-based image where no registry is reachable; see deploy/README.md). The tokenizer's
bentofile declares the runner URLs in ``envs``: they are set while building too, so that building
it never imports the runners' classes and their models stay out of its bento.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BENTOS = {
    "tokenizer": "services/tokenizer/bentofile.yaml",
    "onnx-runner": "runners/onnx/bentofile.yaml",
    "tf-runner": "runners/tf/bentofile.yaml",
    "tenant-runner": "runners/tenants/bentofile.yaml",
    "bento-bundle": "bentofile.yaml",
}


def context(name: str, spec: dict) -> Path:
    """A build context holding only what the bentofile includes, copied from the tree. BentoML
    walks every file of its build context before its patterns filter them, and the tree holds the
    virtual environment and the build outputs, most of the files a walk of it meets and most of a
    build's time. Hidden folders and build/ are not walked here (BentoML leaves .git and .venv out
    of any bento; the patterns name the source folders). The patterns are matched as BentoML
    matches them (pathspec's gitwildmatch). The project's README.md goes in too: BentoML makes it
    the bento's README where the bentofile has no description. What the bentofiles here do not
    use is not copied: a .bentoignore, python.wheels, a description read from a file."""
    from pathspec import PathSpec

    include = PathSpec.from_lines("gitwildmatch", spec.get("include") or ["*"])
    exclude = PathSpec.from_lines("gitwildmatch", spec.get("exclude") or [])
    ctx = ROOT / "build" / "bento-context" / name
    shutil.rmtree(ctx, ignore_errors=True)
    # The README and the files the bentofile names by path, relative to the context (a setup
    # script, requirements).
    docker, python = spec.get("docker") or {}, spec.get("python") or {}
    named = ["README.md", docker.get("setup_script"), docker.get("dockerfile_template"),
             python.get("requirements_txt"), (spec.get("conda") or {}).get("environment_yml")]  # fmt: skip
    for relative in filter(None, named):
        (ctx / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, ctx / relative)
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = [d for d in dirs if not d.startswith(".") and (here / d) != ROOT / "build"]
        for file in files:
            relative = (here / file).relative_to(ROOT).as_posix()
            if include.match_file(relative) and not exclude.match_file(relative):
                (ctx / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(here / file, ctx / relative)
    return ctx


def build(name: str, base_image: str | None) -> str:
    """``bentoml build`` one bentofile; returns the bento's tag."""
    spec = yaml.safe_load((ROOT / BENTOS[name]).read_text())
    if base_image:
        spec.setdefault("docker", {})["base_image"] = base_image
    bentofile = ROOT / "build" / "bentofiles" / f"{name}.yaml"
    bentofile.parent.mkdir(parents=True, exist_ok=True)
    bentofile.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "BENTOML_DO_NOT_TRACK": "True", "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.update({e["name"]: str(e["value"]) for e in spec.get("envs", [])})
    ctx = context(name, spec)
    proc = subprocess.run(
        [str(BIN / "bentoml"), "build", "-f", str(bentofile), "-o", "tag", str(ctx)],
        cwd=ctx, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode:
        raise SystemExit(
            f"error: bentoml build {name} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    tag = proc.stdout.strip().splitlines()[-1].removeprefix("__tag__:")
    print(f"built {tag}", flush=True)
    return tag


def containerize(tag: str, image: str) -> None:
    # bentoml sets DOCKER_BUILDKIT=1 and runs the first `docker` on PATH: Debian's (in /usr/bin) has
    # buildx; the older client in /usr/local/bin does not.
    env = {
        **os.environ,
        "BENTOML_DO_NOT_TRACK": "True",
        "PATH": f"/usr/bin:{BIN}:{os.environ['PATH']}",
    }
    if not shutil.which("docker", path=env["PATH"]):
        raise SystemExit("error: no docker client: run `make engine` first")
    print(f"containerizing {tag} as {image} …", flush=True)
    proc = subprocess.run(
        [str(BIN / "bentoml"), "containerize", tag, "-t", image], cwd=ROOT, env=env
    )
    if proc.returncode:
        raise SystemExit(f"error: bentoml containerize {tag} failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python deploy/bentos.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("command", choices=["build", "images"])
    parser.add_argument("--base-image", default=os.environ.get("BASE_IMAGE") or None)
    parser.add_argument(
        "--only", default=",".join(BENTOS), help="comma-separated subset of " + ",".join(BENTOS)
    )
    parser.add_argument("--tag", default="latest", help="image tag (images)")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if unknown := set(names) - set(BENTOS):
        parser.error(f"unknown bento(s): {', '.join(sorted(unknown))}")
    for name in names:
        tag = build(name, args.base_image)
        if args.command == "images":
            containerize(tag, f"bento-bundle/{name}:{args.tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
