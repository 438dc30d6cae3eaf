"""Every error reply a script sends maps to its typed error (kvstore/_engine/scripts.py:
ERROR_CODES, docs/LAYOUT.md "Script errors"), and an operation hands it on; an error no table
names is a ServerError naming the script."""

from __future__ import annotations

import pytest

from kvstore import UserMessage, errors
from kvstore._engine import core
from kvstore._engine.scripts import ERROR_CODES, SCRIPTS, error_from_reply

from .driver import call, drive

# The codes whose detail starts with a number the error carries.
CARRIED = {"KVS_MEDIA_OVER": "available", "KVS_CURSOR_EXPIRED": "deleted_before_sequence"}


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_each_code_maps_to_its_class_with_its_detail(code):
    detail = f"4096 what {code.lower()} says"
    error = error_from_reply(SCRIPTS["append"], f"{code} {detail}")
    assert type(error) is ERROR_CODES[code]
    assert isinstance(error, errors.KVStoreError)
    if code in CARRIED:
        assert getattr(error, CARRIED[code]) == 4096
    else:
        assert str(error) == detail


def test_the_classes_carrying_a_number_read_it_from_the_detail():
    expired = error_from_reply(
        SCRIPTS["page_plan"], "KVS_CURSOR_EXPIRED 17 no stored message has id 'm3'"
    )
    assert isinstance(expired, errors.MessageNotFound) and expired.deleted_before_sequence == 17
    assert "m3" in str(expired)
    over = error_from_reply(
        SCRIPTS["replace"], "KVS_MEDIA_OVER 0 bytes of inline media are left in the thread"
    )
    assert over.available == 0


def test_a_code_after_the_servers_own_prefix_is_still_found():
    # As a server wraps an error raised (not returned) by a script.
    message = "ERR user_script:1: KVS_DELETING the thread is being deleted script: abc, on @user_script:1."
    assert type(error_from_reply(SCRIPTS["append"], message)) is errors.ThreadDeleting


def test_a_code_without_detail_names_the_code():
    error = error_from_reply(SCRIPTS["append"], "KVS_OTID_REPEATED")
    assert type(error) is errors.OtidRepeated and "KVS_OTID_REPEATED" in str(error)


@pytest.mark.parametrize(
    "message",
    [
        "KVS_NO_SUCH_CODE something",
        "ERR Error running script: attempt to index a nil value",
        "WRONGTYPE Operation",
    ],
)
def test_an_unknown_error_is_a_server_error_naming_the_script(message):
    error = error_from_reply(SCRIPTS["remove_turn"], message)
    assert type(error) is errors.ServerError
    assert "remove_turn.lua" in str(error) and message in str(error)


@pytest.mark.parametrize("code", sorted(CARRIED))
def test_a_carried_number_missing_from_the_detail_is_a_server_error(code):
    error = error_from_reply(SCRIPTS["append"], f"{code} the number is missing")
    assert type(error) is errors.ServerError
    assert "append.lua" in str(error) and "the number is missing" in str(error)


def test_an_acl_refusal_is_permission_denied():
    error = error_from_reply(
        SCRIPTS["append"], "NOPERM this user has no permissions to run the 'fcall' command"
    )
    assert type(error) is errors.PermissionDenied and "append" in str(error)


@pytest.mark.parametrize(
    "code",
    [
        "KVS_WRONGTYPE",
        "KVS_LAYOUT",
        "KVS_TOO_LARGE",
        "KVS_OTID_CONFLICT",
        "KVS_OTID_REPEATED",
        "KVS_DUPLICATE_ID",
        "KVS_ID_REPEATED",
        "KVS_TURN_FINISHED",
    ],
)
def test_an_append_hands_on_the_errors_it_does_not_handle(thread, code):
    error = error_from_reply(SCRIPTS["append"], f"{code} detail")
    with pytest.raises(ERROR_CODES[code]) as raised:
        drive(core.append(thread, UserMessage(content="x"), "turn-1"), call("append", error=error))
    assert raised.value is error


def test_the_subclasses_keep_their_parents_catchable():
    assert issubclass(ERROR_CODES["KVS_OTID_REPEATED"], ERROR_CODES["KVS_OTID_CONFLICT"])
    assert issubclass(ERROR_CODES["KVS_ID_REPEATED"], ERROR_CODES["KVS_DUPLICATE_ID"])
    assert issubclass(ERROR_CODES["KVS_CURSOR_EXPIRED"], ERROR_CODES["KVS_CURSOR_NOT_FOUND"])
    assert issubclass(ERROR_CODES["KVS_MIGRATING"], errors.LayoutError)
