"""spec.networkPolicy (api/spec/network.py): the egress except list, its duplicates and its length bound."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.api import spec

from fixtures.cases import parse

EXAMPLE = "such as 169.254.169.254/32 or fd00:ec2::254/128"


def egress_refusal(excepted: list[Any]) -> list[str]:
    with pytest.raises(spec.SpecError) as err:
        parse(networkPolicy={"egress": {"enabled": True, "except": excepted}})
    return err.value.problems


def test_a_cidr_listed_twice_is_named_alone_not_with_every_other_cidr() -> None:
    assert egress_refusal(["10.0.0.0/8", "192.168.0.0/16", "10.0.0.0/8", "fd00::/8"]) == [
        "spec.networkPolicy.egress.except lists a CIDR twice: ['10.0.0.0/8']"
    ]


# A prefix length padded with zeros to the given length: a CIDR ipaddress reads as 10.0.0.0/8.
def padded(length: int) -> str:
    return "10.0.0.0/" + "8".rjust(length - len("10.0.0.0/"), "0")


def test_a_cidr_of_up_to_64_characters_is_read_and_told_its_canonical_form() -> None:
    assert egress_refusal([padded(64)]) == [
        f"spec.networkPolicy.egress.except[0] must be written '10.0.0.0/8' (its network's first address, in "
        f"canonical form), got '{padded(64)}'"
    ]


def test_a_cidr_longer_than_64_characters_is_refused_unread() -> None:
    assert egress_refusal([padded(65)]) == [
        f"spec.networkPolicy.egress.except[0] must be a CIDR {EXAMPLE} (an address, '/', a prefix length), "
        f"got '{padded(65)}'"
    ]
