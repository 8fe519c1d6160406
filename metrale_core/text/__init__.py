"""Text in and out of the model: the text room.

Owner: ``metrale_core.text``.  ``tokenizer`` (HF and GGUF vocabularies behind one interface),
``tokenizer_spm`` (SentencePiece models), ``chat_template`` (rendering a conversation through the
model's Jinja template) and ``detokenizer`` (incremental, UTF-8 safe text from token ids).

Invariants: importing the package imports none of its modules; nothing here imports the engine.
"""
