"""The roles ``dispatch.testing`` ships inside the package are exactly those deploy/ installs."""

from __future__ import annotations

from pathlib import Path

from dispatch.testing._rbac import SHIPPED_RBAC

ROOT = Path(__file__).resolve().parents[2]


def test_the_packaged_roles_are_deploys() -> None:
    deployed = ROOT / "deploy" / "base" / "rbac.yaml"
    assert SHIPPED_RBAC.read_bytes() == deployed.read_bytes(), (
        f"{SHIPPED_RBAC.relative_to(ROOT)} differs from {deployed.relative_to(ROOT)}: copy it over "
        f"(cp {deployed.relative_to(ROOT)} {SHIPPED_RBAC.relative_to(ROOT)})")
