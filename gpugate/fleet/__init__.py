"""Fleet views: which node runs which version of every component (audit),
gpugate's drains at a glance (status), baseline capture and review.

May import: the layers below it (core .. keeper)."""
