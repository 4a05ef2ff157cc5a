import sys, statistics as st, random
rows=[l.split() for l in open(sys.argv[1]) if l.strip()]
by={}
for b,cfg,r,h,p in rows:
    by.setdefault(cfg,[]).append((float(h),float(p)))
def ci(xs, n=2000):
    random.seed(1)
    meds=sorted(st.median(random.choices(xs,k=len(xs))) for _ in range(n))
    return meds[int(0.025*n)], meds[int(0.975*n)]
for cfg,v in by.items():
    r=[p/h for h,p in v]
    lo,hi=ci(r)
    print(f"{cfg}: n={len(v)} host med {st.median([h for h,_ in v]):.2f} pod med {st.median([p for _,p in v]):.2f} pod/host paired median {st.median(r):.3f} (bootstrap 95% {lo:.3f}-{hi:.3f}) >=0.98: {sum(x>=0.98 for x in r)}/{len(r)}")
# on vs off: pair by block & rep
on={(b,r):(float(h),float(p)) for b,c,r,h,p in rows if c=='on'}
off={(b,r):(float(h),float(p)) for b,c,r,h,p in rows if c=='off'}
k=[x for x in on if x in off]
rr=[(on[x][1]/on[x][0])/(off[x][1]/off[x][0]) for x in k]
lo,hi=ci(rr)
print(f"(pod/host on)/(pod/host off) paired by block+rep: n={len(rr)} median {st.median(rr):.3f} ({lo:.3f}-{hi:.3f}) >1: {sum(x>1 for x in rr)}")
