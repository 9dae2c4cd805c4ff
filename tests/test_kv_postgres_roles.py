"""Each host may log in as its own database role: one role owns lakefuse's tables, host roles
are granted row access only (no CREATE), and every graveler operation works for each."""

from __future__ import annotations

import psycopg
import pytest

from graveler import Graveler, GravelerConfig
from graveler.model import Entry
from tests import pg_testutil

pytestmark = pytest.mark.usefixtures("postgres_url")


def _role_url(base_url: str, role: str, schema: str) -> str:
    url = base_url.replace("postgresql://postgres@", f"postgresql://{role}@")
    return f"{url}&options=-csearch_path%3D{schema}"


def test_two_hosts_with_their_own_roles_share_one_repository(postgres_url, tmp_path):
    schema = "roles_" + tmp_path.name.replace("-", "_")[-30:].lower()
    with psycopg.connect(postgres_url, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
        for role in ("lf_host_a", "lf_host_b", "lf_owner"):
            c.execute(f"DO $$BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END$$")
        c.execute(f"ALTER SCHEMA {schema} OWNER TO lf_owner")
    # the owner's first use creates the tables; then the hosts get row access only
    owner = Graveler(GravelerConfig.from_home(tmp_path / "owner", kv_url=_role_url(postgres_url, "lf_owner", schema)))
    assert owner.list_repositories() == []
    owner.close()
    with psycopg.connect(postgres_url, autocommit=True) as c:
        for role in ("lf_host_a", "lf_host_b"):
            c.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            c.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")

    a = Graveler(GravelerConfig.from_home(tmp_path / "a", kv_url=_role_url(postgres_url, "lf_host_a", schema)))
    b = Graveler(GravelerConfig.from_home(tmp_path / "b", kv_url=_role_url(postgres_url, "lf_host_b", schema)))
    ns = (tmp_path / "ns").as_uri()
    repo_a = a.create_repository("shared", ns)
    src = tmp_path / "f"
    src.write_bytes(b"from host a")
    repo_a.upload("main", "a.txt", str(src))
    repo_b = b.repository("shared")
    got = repo_b.get("main", "a.txt")
    assert isinstance(got, Entry) and got.size == len(b"from host a")
    commit = repo_b.commit("main", "committed by host b")
    assert repo_a.get_branch("main").commit_id == commit.id
    assert [r.name for r in a.list_repositories()] == ["shared"] == [r.name for r in b.list_repositories()]
    a.close()
    b.close()
    from graveler.kv.postgres import close_pg_backends

    close_pg_backends()
