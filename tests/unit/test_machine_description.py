"""A benchmark record names the CPU it ran on and the instruction sets the engine's kernels pick
from: int8's speed against fp32's likely depends on them (AVX-512 VNNI or not), so two records are
compared knowing whether they ran on the same kind of core."""

from __future__ import annotations

import platform

from loadtests import cpu

# Two processors of /proc/cpuinfo, trimmed: the first block names them all.
ZEN3 = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC
flags		: fpu sse2 avx avx2 fma bmi2

processor	: 1
model name	: another name the record must not take
flags		: avx512f avx512_vnni
"""


def test_a_record_names_the_cpu_its_family_and_the_instruction_sets_it_has() -> None:
    said = cpu.machine(ZEN3)
    assert ", AMD EPYC, family 25 model 1, avx2, " in said
    assert "avx512" not in said and "another name" not in said
    with_vnni = ZEN3.replace("bmi2\n", "bmi2 avx512f avx512_vnni\n", 1)
    assert ", family 25 model 1, avx2 avx512f avx512_vnni, " in cpu.machine(with_vnni)


def test_a_cpu_with_none_of_the_sets_says_so_and_one_without_cpuinfo_still_is_named() -> None:
    assert "none of avx2/avx512f" in cpu.machine(ZEN3.replace("avx avx2 ", "", 1))
    said = cpu.machine("")
    assert f" cores, {platform.processor() or 'CPU model unknown'}, " in said
    assert "family" not in said
