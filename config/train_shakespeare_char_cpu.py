# nanoGPT's CPU recipe (its README: ~1.88 val loss), its learning rate 1e-3 included:
# train.py's defaults on a machine with no GPU but for the rate (4e-3 there, tied with 8e-3, best
# of 2e-3, 4e-3, 8e-3: lab/results/cpu_tuned). A few minutes on 2 cores.
# python train.py config/train_shakespeare_char_cpu.py --residual=mhc
dataset = "shakespeare_char"
device = "cpu"
eval_interval = 250
eval_iters = 50
batch_size = 12
block_size = 64
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
