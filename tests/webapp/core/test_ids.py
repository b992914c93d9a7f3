import re

import pytest

from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id


def test_it_builds_prefixed_url_safe_ids():
    ids = {new_public_id("ds") for _ in range(2000)}
    assert len(ids) == 2000
    for public_id in ids:
        assert re.fullmatch(r"ds_[A-Za-z0-9]{16}", public_id)
    # A trailing underscore in the prefix is not doubled, whatever the random part starts with.
    assert all(re.fullmatch(r"bm_[A-Za-z0-9]{16}", new_public_id("bm_")) for _ in range(500))
    assert len(new_public_id("abcdefgh")) <= PUBLIC_ID_MAX_LENGTH


@pytest.mark.parametrize("prefix", ["", "DS", "d-s", "toolongprefix"])
def test_it_rejects_bad_prefix(prefix):
    with pytest.raises(ValueError, match="prefix"):
        new_public_id(prefix)
