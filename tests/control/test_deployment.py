"""Deployment strings: what parses, and errors that say why the rest does not."""

import pytest

from pearl.control.deployment import Deployment


@pytest.mark.parametrize(
    "text, label, workers",
    [("8C", "8C", 8), ("colocated:2", "2C", 2), ("5p3d", "5P3D", 8), (" 1P1D ", "1P1D", 2)],
)
def test_deployments_parse(text, label, workers):
    d = Deployment.parse(text)
    assert d.label == label and d.num_workers == workers


@pytest.mark.parametrize(
    "text, why",
    [
        ("3P0D", "needs at least one prefill and one decode worker"),
        ("0P2D", "needs at least one prefill and one decode worker"),
        ("0C", "needs at least one worker"),
        ("8X", "is not one of: '8C', 'colocated:8', '5P3D'"),
        ("P3D", "is not one of"),
        ("-1C", "is not one of"),
    ],
)
def test_impossible_deployments_say_why(text, why):
    with pytest.raises(ValueError, match=why) as info:
        Deployment.parse(text)
    assert repr(text) in str(info.value)  # names what was given
