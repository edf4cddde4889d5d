import json
import os
import statistics as st

with open(os.environ['OUTSIDE_OUT']) as f:
    rows = [r for r in (json.loads(line) for line in f) if r['tag'] != 'sweep']
for wl in 'ABC':
    k = {r['tag']: r for r in rows if r['wl'] == wl and r['system'] == 'keras'}
    c = {r['tag']: r for r in rows if r['wl'] == wl and r['system'] == 'cerebro'}
    if not k or not c:
        continue
    print(f'## Workload {wl}')
    print('| round | order | seq Keras s | cerebro cold s | cerebro warm s | cold/seq | warm/seq | 1st unit cold s | 1st unit warm s | load1 (k/c) |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    ks, cs, ws, rc, rw = [], [], [], [], []
    for t in sorted(k):
        kk, cc = k[t], c[t]
        order = 'Keras first' if int(t[1:]) % 2 else 'cerebro first'
        ks.append(kk['total_s']); cs.append(cc['cold']['s']); ws.append(cc['warm']['s'])
        rc.append(cc['cold']['s'] / kk['total_s']); rw.append(cc['warm']['s'] / kk['total_s'])
        print(f"| {t} | {order} | {kk['total_s']:.2f} | {cc['cold']['s']:.2f} | {cc['warm']['s']:.2f} | {rc[-1]:.3f} | {rw[-1]:.3f} | {cc['cold']['first_unit_s']:.2f} | {cc['warm']['first_unit_s']:.3f} | {kk['load1']:.2f}/{cc['cold']['load1']:.2f} |")
    print(f"| **median** | | **{st.median(ks):.2f}** | **{st.median(cs):.2f}** | **{st.median(ws):.2f}** | **{st.median(rc):.3f}** | **{st.median(rw):.3f}** | | | |")
    print(f"median-of-medians ratio cold {st.median(cs)/st.median(ks):.3f}, warm {st.median(ws)/st.median(ks):.3f}")
    print('best val acc: keras', [k[t]['best_val_acc'] for t in sorted(k)], 'cerebro cold/warm', [(round(c[t]['cold']['best_val_acc'],4), round(c[t]['warm']['best_val_acc'],4)) for t in sorted(c)])
    co = [max(v['VmRSS'] for v in c[t]['peaks'].values() if v['role']=='coordinator') for t in sorted(c)]
    coh = [max(v['VmHWM'] for v in c[t]['peaks'].values() if v['role']=='coordinator') for t in sorted(c)]
    coa = [max(v['RssAnon'] for v in c[t]['peaks'].values() if v['role']=='coordinator') for t in sorted(c)]
    wk = [max(v['VmRSS'] for v in c[t]['peaks'].values() if v['role']=='worker') for t in sorted(c)]
    wka = [max(v['RssAnon'] for v in c[t]['peaks'].values() if v['role']=='worker') for t in sorted(c)]
    print(f'coordinator peak VmRSS MB {co}, VmHWM {coh}, RssAnon {coa}; worker peak VmRSS MB {wk}, RssAnon {wka}')
    print()
