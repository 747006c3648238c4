"""The per-machine table agrees with itself and with glibc's loader and cache tables."""

from __future__ import annotations

from pyxis_hook.loader import cachelookup, ldcache, loaderenv, machines


def test_what_ldconfig_writes_is_what_the_loader_of_that_class_accepts():
    for m in machines.MACHINES.values():
        assert m.abi | ldcache.FLAG_ELF_LIBC6 in cachelookup.LOADER_FLAGS[m.cache_loader], m.name
        if m.abi32 is not None:
            assert m.abi32 | ldcache.FLAG_ELF_LIBC6 in cachelookup.LOADER_FLAGS[m.cache_loader32], m.name


def test_loader_paths_agree_with_the_resolver():
    for m in machines.MACHINES.values():
        for cls, em, loader in ((64, m.em, m.loader), (32, m.em32, m.loader32)):
            if (cls, em) in loaderenv.DEFAULT_RTLD:
                assert loaderenv.DEFAULT_RTLD[(cls, em)] == loader, m.name


def test_dirs_and_triplets():
    assert machines.triplets("x86_64") == ("x86_64-linux-gnu", "i386-linux-gnu")
    assert machines.triplets("riscv64") == ("riscv64-linux-gnu", None)
    assert machines.lib_dirs("x86_64", 32) == ("/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu", "/lib", "/usr/lib")
    assert machines.lib_dirs("aarch64", 32) == ("/lib", "/usr/lib")
    assert machines.lib_dirs("ppc64le", 64)[:2] == ("/lib/powerpc64le-linux-gnu", "/usr/lib/powerpc64le-linux-gnu")
    assert machines.abi_byte("aarch64") == 0x0A00 and machines.abi_byte("s390x") == 0x0400
    assert machines.abi_byte("mips") == 0
