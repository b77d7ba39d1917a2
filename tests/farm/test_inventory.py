"""farm.toml, addresses and DNS expansion."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rknn_client.farm.auth import DeviceAuth, auth_token
from rknn_client.farm.inventory import FarmConfigError, gather, load_farm_file, parse_address


def test_farm_file_merges_defaults_and_resolves_token_files(tmp_path: Path) -> None:
    (tmp_path / "secret.token").write_text("s3cret\n")
    farm = tmp_path / "farm.toml"
    farm.write_text(
        """
[defaults]
labels = { rack = "r1", firmware = 160 }
auth = { token_file = "secret.token" }

[[device]]
name = "a"
address = "tcp://10.0.0.5:50515"
labels = { soc = "RK3588" }

[[device]]
name = "b"
address = "tcp://10.0.0.6:50515"
labels = { rack = "r2" }
auth = { token = "literal" }
"""
    )
    a, b = load_farm_file(farm)
    assert (a.name, a.address) == ("a", "tcp://10.0.0.5:50515")
    assert a.labels == {"rack": "r1", "firmware": "160", "soc": "rk3588"}
    assert a.soc("rk3566") == "rk3588"  # a configured soc label wins over what the daemon reports
    assert b.labels == {"rack": "r2", "firmware": "160"}
    assert b.soc("rk3566") == "rk3566"
    assert auth_token(a.auth) == "s3cret"
    assert auth_token(b.auth) == "literal"
    assert auth_token(None) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[device]]\nname = "x"\n', "needs an address"),
        ('[[device]]\naddress = "tcp://h:1"\ncolour = "red"\n', "unknown key"),
        ('[[device]]\naddress = "tcp://h:1"\nlabels = { a = [1] }\n', "labels must be a table"),
        ('[[device]]\naddress = "tcp://h:1"\nauth = { password = "x" }\n', "auth must be"),
        ('[[device]]\naddress = "ftp://h:1"\n', "not a farm address"),
        (
            '[[device]]\nname = "x"\naddress = "tcp://h:1"\n[[device]]\nname = "x"\naddress = "tcp://h:2"\n',
            "two devices",
        ),
        ("[boards]\n", "unknown section"),
        ("[[device]\n", "not valid TOML"),
    ],
)
def test_farm_file_errors_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "farm.toml"
    path.write_text(text)
    with pytest.raises(FarmConfigError, match=message):
        load_farm_file(path)


def test_missing_token_file_is_reported() -> None:
    with pytest.raises(Exception, match="cannot read the token file"):
        DeviceAuth(token_file=Path("/nonexistent/token")).resolve()


def test_dns_name_expands_to_every_record() -> None:
    def resolver(host: str, port: int, type: int) -> list[tuple[object, ...]]:
        assert (host, port) == ("rknn.farm.svc", 50515)
        return [
            (socket.AF_INET, type, 6, "", ("10.1.0.7", port)),
            (socket.AF_INET, type, 6, "", ("10.1.0.7", port)),  # same address twice (two protocols)
            (socket.AF_INET, type, 6, "", ("10.1.0.8", port)),
            (socket.AF_INET6, type, 6, "", ("fd00::9", port, 0, 0)),
        ]

    entries = parse_address("dns://rknn.farm.svc:50515", name="k8s", resolver=resolver)
    assert [(e.name, e.address) for e in entries] == [
        ("k8s[10.1.0.7]", "tcp://10.1.0.7:50515"),
        ("k8s[10.1.0.8]", "tcp://10.1.0.8:50515"),
        ("k8s[fd00::9]", "tcp://[fd00::9]:50515"),
    ]


def test_dns_with_the_real_resolver() -> None:
    addresses = {e.address for e in parse_address("dns://localhost:50515")}
    assert "tcp://127.0.0.1:50515" in addresses


def test_dns_needs_a_port_and_a_resolvable_name() -> None:
    with pytest.raises(FarmConfigError, match="needs a name and a port"):
        parse_address("dns://rknn.farm.svc")
    with pytest.raises(FarmConfigError, match="does not resolve"):
        parse_address("dns://no-such-host.invalid:1")


def test_gather_combines_file_and_addresses(tmp_path: Path) -> None:
    path = tmp_path / "farm.toml"
    path.write_text('[[device]]\nname = "a"\naddress = "tcp://10.0.0.5:1"\n')
    entries = gather(path, ["tcp://10.0.0.9:2", "adb:SERIAL1"])
    assert [(e.name, e.address) for e in entries] == [
        ("a", "tcp://10.0.0.5:1"),
        ("10.0.0.9:2", "tcp://10.0.0.9:2"),
        ("SERIAL1", "adb:SERIAL1"),
    ]
