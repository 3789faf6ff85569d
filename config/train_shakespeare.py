# Tiny Shakespeare with the GPT-2 BPE tokenizer (338k tokens), a 6 x 384 model on
# one GPU. The data is small for a 50k vocabulary: expect overfitting after ~2000
# iterations, so the best checkpoint is kept.
# python train.py config/train_shakespeare.py --residual=norm_gated_ihc
dataset = "shakespeare"
eval_interval = 250
eval_iters = 100
always_save_checkpoint = False
batch_size = 32
block_size = 256
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
learning_rate = 6e-4
max_iters = 3000
lr_decay_iters = 3000
min_lr = 6e-5
beta2 = 0.99
warmup_iters = 100
