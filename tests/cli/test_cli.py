"""The `colibri` command: doctor reports every probe and exits 0 without root."""

import subprocess
import sys

from colibri.cli import main


def test_doctor_reports_every_probe(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("cpu", "simd", "memory", "huge pages", "transparent huge pages", "mlock limit",
                 "nvcc", "pycuda", "cuda device"):
        assert f" {name} " in out, name
    # a missing huge-page reservation comes with the command that fixes it
    if "HugePages_Free=0" in out:
        assert "nr_hugepages" in out


def test_console_script_runs_as_module():
    r = subprocess.run([sys.executable, "-m", "colibri", "doctor"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "colibri" in r.stdout and "simd" in r.stdout


def test_no_command_prints_help_and_fails():
    assert main([]) == 2
