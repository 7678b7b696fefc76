"""The hub page /hub/gpulab/doctor: the last ``gpulab doctor`` report, for admins."""

from __future__ import annotations

from pathlib import Path

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab_hub import hubsettings
from gpulab_hub.doctor.findings import counts, from_dicts
from gpulab_hub.doctor.report import load_last


class DoctorHandler(BaseHandler):
    @property
    def report_path(self) -> Path:
        return hubsettings.of_handler(self).doctor_report

    @web.authenticated
    async def get(self):
        if not self.current_user.admin:
            raise web.HTTPError(403, "Only admins may see the doctor's report.")
        report = load_last(self.report_path)
        findings = from_dicts(report["findings"]) if report else []
        html = await self.render_template(
            "gpulab-doctor.html",
            report=report,
            findings=findings,
            counts=counts(findings),
            report_path=str(self.report_path),
        )
        self.finish(html)
