"""In-context piecewise regression: targets are A_c x for the region x came from."""
import torch

from mixzoo.registry import tasks


def test_targets_are_region_maps_and_format():
    t = tasks()["icl-regression"](L=16, S=4, d_x=6, d_y=5, n_queries=3)
    assert (t.kind, t.backbone, t.d_in, t.d_out, t.seq_len) == ("regression", "vector", 11, 5, 19)
    assert [m.name for m in t.metrics] == ["mse", "nmse"] and not t.metrics[0].higher_is_better
    d = t.sample("test", 8, 0)
    A, x, seg = d["A"], d["x"], d["segment"]
    want = torch.einsum("ncij,ntj->ntci", A, x)                     # every region's map applied
    got_seg = want.gather(2, seg[:, :, None, None].expand(-1, -1, 1, 5))[:, :, 0]
    assert torch.allclose(d["y"], got_seg, atol=1e-5), "noiseless test: y = A_c x exactly"
    counts = torch.stack([(seg[:, :16] == c).sum(1) for c in range(4)], 1)
    assert (counts == 4).all(), "S pairs per region in the context"
    assert not (seg[:, :16] == torch.arange(4).repeat_interleave(4)).all(), "context is shuffled"
    # x lies in its region's cone: closer to its own direction than to the others
    cos = torch.einsum("ntd,ncd->ntc", x / x.norm(dim=-1, keepdim=True), d["mu"])
    assert (cos.argmax(-1) == seg).float().mean() > 0.95
    b = t.generate("test", 8, 0)
    assert b.mask[:, -3:].all() and not b.mask[:, :-3].any()
    assert torch.allclose(b.targets[:, -3:], d["y"][:, 16:])
    assert torch.equal(b.inputs[:, :16, :6], x[:, :16]) and torch.equal(b.inputs[:, :16, 6:], d["y"][:, :16])
    assert (b.inputs[:, 16:, 6:] == 0).all(), "queries carry no y"


def test_training_noise_and_interleaved_format():
    t = tasks()["icl-regression"](L=8, S=4, d_x=4, d_y=4, n_queries=2, noise=0.5, token_format="interleaved")
    d = t.sample("train", 64, 0)
    resid = d["y"] - d["clean"]
    assert 0.4 < float(resid.std()) < 0.6
    assert t.seq_len == 18
    b = t.generate("train", 4, 0)
    assert (b.inputs[:, 0:16:2, 4:] == 0).all() and (b.inputs[:, 1:16:2, :4] == 0).all()
    assert b.mask[:, 16:].all() and not b.mask[:, :16].any()
    q = tasks()["icl-regression"](L=8, S=4, d_x=4, d_y=4, n_queries=2, noise=0.5, noisy_train_queries=False)
    d = q.sample("train", 4, 0)
    assert torch.equal(d["y"][:, 8:], d["clean"][:, 8:])
