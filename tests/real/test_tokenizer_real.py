import pytest

from specrouter.errors import TokenizerMismatchError
from specrouter.vocab import check_shared_tokenizer

from .conftest import SMALL, SMOL, TARGET


def test_qwen_pair_shares_a_tokenizer(pool):
    check_shared_tokenizer([pool.level(SMALL), pool.level(TARGET)])


def test_smollm2_with_qwen_is_refused_naming_both_and_the_token(pool):
    with pytest.raises(TokenizerMismatchError) as info:
        pool.chain([SMOL, TARGET])
    message = str(info.value)
    assert f"{SMOL} and {TARGET} do not share a tokenizer: token " in message
    assert " in smollm2-135m but " in message


def test_chat_template_from_the_gguf_is_used(pool):
    from specrouter.chat import render_chat

    text = render_chat(pool.level(TARGET), [{"role": "user", "content": "hi"}])
    assert "<|im_start|>user\nhi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
