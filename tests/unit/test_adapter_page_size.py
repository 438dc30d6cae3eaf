"""The adapters' older pages past passed-over messages (kvstore/integrations/_dicts.py): sized
by what is still missing, four times larger for each older page before, at most 1,000."""

from kvstore.integrations._dicts import page_size


def test_one_message_missing_after_a_summary_reads_a_small_page():
    # get_items(50) whose newest page held a summary: one item missing, not a page of 200.
    assert page_size(1, 1) == 4
    assert page_size(50, 0) == 50


def test_a_long_walk_grows_to_the_largest_page_and_stays_there():
    sizes = [page_size(1, before) for before in range(8)]
    assert sizes == [1, 4, 16, 64, 256, 1000, 1000, 1000]
    assert sum(sizes[:5]) >= 300  # 300 retracted items passed in five pages
    assert page_size(0, 0) == 1 and page_size(5000, 0) == 1000
